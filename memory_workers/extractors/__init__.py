"""Consolidation extractors: turn a batch of episodes into a validated :class:`shared.extraction.Extraction`."""

from __future__ import annotations

from memory_workers.extractors.command import CommandExtractor
from memory_workers.extractors.heuristic import HeuristicExtractor
from memory_workers.extractors.openai import OpenAIExtractor
from shared.config import ConsolidationSettings
from shared.extraction import Extractor

__all__ = ["CommandExtractor", "HeuristicExtractor", "OpenAIExtractor", "build_extractor"]


def build_extractor(settings: ConsolidationSettings) -> Extractor:
    """The extractor ``consolidation.extractor`` names; build it once per worker process and reuse it."""
    if settings.extractor == "openai":
        return OpenAIExtractor(settings)
    if settings.extractor == "command":
        return CommandExtractor(settings)
    return HeuristicExtractor(settings)
