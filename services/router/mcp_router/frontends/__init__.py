"""The router's front doors: thin adapters from each protocol (KServe V2 gRPC and REST, the mesh's v1/v2
gRPC) to the DataPlane, and the Triton shared memory regions they read tensors from."""
