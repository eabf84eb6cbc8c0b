"""``superinfer conform``: does an engine keep its priority and SLO promises? Scenarios
(``scenarios.py``, workloads in ``workloads.py``), the decision observer for in-process engines
(``observe.py``) and the runner and matrix (``runner.py``). Definitions: docs/conformance.md."""
