"""Built-in scheduling policies; each registers under its name in the ``superinfer.policies``
entry-point group, exactly as a third-party policy would."""
