"""GPU accounting: allocated, busy and idle GPU-seconds and energy per holder, integrated
every collection cycle (plan.py: one cycle's weights; ledger.py: the counters across
cycles, and the holders that ended). Who held what comes from workloads/usage.py."""
