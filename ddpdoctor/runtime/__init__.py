"""The runtime of ``ddpdoctor check``: who am I, self-launch, the control plane, deadlines, aggregation."""
