"""The context policies' turn halves: what a reply's context is and how the engine computes it."""
