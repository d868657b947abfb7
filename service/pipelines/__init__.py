"""One pipeline per served task: its inputs (tokenize, window, decode images), the engine call, its results.

Each task's file holds its pipeline (``classify``, ``extract``, ``translate``,
``generate``); the numpy pieces the export stage reuses for evaluation live
beside them (``text_inputs``, ``image_inputs``, ``qa_spans``, ``entity_spans``),
so what is evaluated is what is served. No torch, no HTTP.
"""
