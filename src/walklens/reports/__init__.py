"""Reports: self-contained HTML (inline JS, no CDN) plus PNG figures. Reports draw; they never load models."""

from .html import Report

__all__ = ["Report"]
