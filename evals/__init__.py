"""Downstream evaluation of trained models (beyond the validation loss)."""
