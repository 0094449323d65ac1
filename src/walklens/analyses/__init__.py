"""The analyses of both papers: walks and similarity maps, the decoding walk, attention (A.3), kernels (A.2), the
power method (seed 002), steering, concepts and compaction (footnote 11), the associative organisation, the parity
card.  Each returns plain dataclasses and never draws; every verb and result type resolves lazily
(``walklens.analyses.X``)."""

from __future__ import annotations

import importlib

from ..base.exports import lazy_exports, names

_PUBLIC: dict[str, tuple[str, ...]] = {
    "walks": ("encoding_walk", "similarity_map", "EncodingWalk", "TargetAnswer"),
    "simmap": ("SimilarityMap", "SimilarityPair", "compare_maps", "similarity_frame"),
    "association": (
        "block_contrast",
        "cooccurrence",
        "token_classes",
        "BlockContrast",
        "ClassContrast",
        "Cooccurrence",
        "Correlation",
    ),
    "decoding": ("decoding_walk", "decoding_walks", "DecodingWalk"),
    "parity": ("verify", "ParityCard", "ParityCheck"),
    "attention": (
        "head_matrices",
        "attention_identity",
        "cluster_view",
        "self_mass",
        "head_stats",
        "HeadMatrices",
        "IdentityResult",
        "IdentityCheck",
        "ClusterView",
        "SelfMass",
        "HeadStats",
    ),
    "kernels": (
        "position_kernels",
        "empirical_kernels",
        "position_only_attention",
        "classify_kernel",
        "t5_kernel_values",
        "PositionKernels",
        "StackKernels",
        "KernelClass",
        "DEFAULT_CORPUS",
    ),
    "power": (
        "power_spectra",
        "alignment",
        "alignment_from_states",
        "power_iterate",
        "predicted_alignment",
        "fitted_rate",
        "PowerSpectra",
        "LayerSpectrum",
        "HeadSpectrum",
        "Alignment",
    ),
    "idealised": ("dynamics", "shared_weights", "Dynamics", "SharedWeights"),
    "steering": (
        "steer",
        "activation_addition",
        "steering_sweep",
        "direction",
        "choose_sign",
        "target_score",
        "neutral_kl",
        "repetition",
        "distinct_n",
        "NEUTRAL",
        "SteerResult",
        "SteerRow",
        "SteeringSweep",
    ),
    "compaction": ("compact", "Compacted", "CompactSpec", "CompactionReport"),
    "patching": ("patch", "attribute", "path_patch", "patch_vector", "PatchResult", "walk_beside_patch", "WalkBeside"),
    "concepts.cache": ("ConceptCache",),
    "controlvectors": (
        "ControlVector",
        "control_vector",
        "write_control_vector",
        "read_control_vector",
        "apply_control_vector",
    ),
}

__getattr__ = lazy_exports(globals(), _PUBLIC, lambda module: importlib.import_module(f".{module}", __name__))
__all__ = names(_PUBLIC)
