"""The engines kvspec checks, one sub-package each: the adapters that put a release's own classes
behind kvspec's constructors (``vllm``, ``sglang``; InfiniLM's classes need none), the builders of
CPU import trees from a wheel or a clone (stand-ins for the imports a CPU cannot satisfy), and the
tree cache they share (:mod:`kvspec.engines.trees`)."""
