"""SQL of forget jobs and of swapping a rebuilt session in."""
