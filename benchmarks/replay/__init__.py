"""Reclamation replay: month-long synthetic notebook traces with ground truth, and their score."""
