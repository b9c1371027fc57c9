"""The context policies' transition halves: what a reply's context is and how the engine computes it."""
