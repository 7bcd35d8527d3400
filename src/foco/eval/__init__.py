"""Evaluation: compose -> rank -> score, one path for every benchmark."""
