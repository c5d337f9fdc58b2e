"""The derive stage: state kept across cycles (XID and clock-event totals, windows, health,
GPU accounting) and DCGM's semantics, turned into frozen values for the exposition."""
