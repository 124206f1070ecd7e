"""Model execution backends behind one small interface (numpy, onnx, cuda).

``create_backend(config, weights)`` builds the backend a model.yaml names from its decrypted weights
bytes; the backend modules themselves are imported only when a model needs them (see ``base``).
"""

from mcp_worker.backends.base import BACKEND_CLASSES, Backend, backend_class, create_backend

__all__ = ["BACKEND_CLASSES", "Backend", "backend_class", "create_backend"]
