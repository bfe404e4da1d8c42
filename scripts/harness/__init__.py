"""What the scripts and the tests share: starting a `localspec serve` and stopping it (`serverproc`), Chromium
for the page (`browserproc`), llama.cpp's own tools built from the pinned sdist (`llamacpp_tools`), tiny GGUFs
of any architecture (`tinygguf`, `tinyarch`), the fault probes (`faults`), and helper hosts in network
namespaces (`netns`) behind the relay that delays them (`relay`). A script imports it as `harness`, its own
folder being first on the path Python searches; the tests reach it through pytest's `pythonpath` setting."""
