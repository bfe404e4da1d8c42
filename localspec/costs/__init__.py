"""What passes cost on this machine, and the choices made from it: the cost model and the one plausibility rule
(`costmodel`), measuring, storing and reusing a pair's pass costs (`tuning`), predicted speedups beside measured
ones (`predictions`), when they are measured without anyone waiting (`idle`), the attention kernel a CPU runs
(`attention`), and decode threads that follow the machine's load (`threads`)."""
