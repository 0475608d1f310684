"""Preference pairs (the world's, labelled; a user's JSONL or Hugging Face dataset), where external rows come from, and
the errors of a dataset a job cannot use."""
