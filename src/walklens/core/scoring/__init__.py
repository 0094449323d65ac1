"""Scoring continuations: hidden states, log-likelihoods of continuations, packed scoring requests."""
