"""The Open Inference Protocol (KServe v2) apart from its transports: tensors, each task's signature from
its contract, one ``infer``, and the metadata. The HTTP door (``api/v2``) and the gRPC door
(``api/grpc``) both render it; neither imports the other."""
