"""The numbers of the artifact's scheduling rules (simulator/simulator.py, easy_policy.py), and ours."""

ROUND_S = 60.0  # a scheduling round: the artifact's --interval default, and the paper's
ARTIFACT_START_S = 20.0  # what a job's first start costs (the artifact's Job.rescale_time, paid once)
MAX_WASTE = 0.30  # an elastic placement leaves at most this share of its devices' capacity unused (Job._max_waste)
MAX_GROWTH = 2  # devices after a round ≤ 2 × before (Job.submit_proposals)
MAX_SIM_TIME_S = 30 * 24 * 3600.0  # ours: past this, unfinished jobs are an error, never an endless loop
MAX_ROUNDS = 10_000_000  # ours: max_sim_time_s ÷ round_s above this is an error (a simulation that could not end)
