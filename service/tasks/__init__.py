"""Per-task pre- and post-processing, between the HTTP layer and the engine; numpy only, no torch.

The export stage imports these too (QA windows for training labels, span and
entity decoding for evaluation), so what is evaluated is what is served.
"""
