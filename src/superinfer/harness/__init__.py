"""The harness: rooms along a run's data path, each importing only the rooms before it.

``errors`` <- ``workload`` <- ``report`` <- ``policies`` <- ``engines`` <- ``bench`` <- ``grid``
<- ``offline`` <- ``suites``. Only the CLI imports the harness.
"""
