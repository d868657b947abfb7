"""Open Inference Protocol v2 over gRPC: KServe's ``GRPCInferenceService`` (what Triton serves), one more door."""
