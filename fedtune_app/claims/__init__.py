"""The claims harness (``fedtune claims``): the papers' claims checked on paired seeds.

registry    the claims, their settings and arms, the statistical plan and the two verdict rules
entries     what a registry entry is: a setting, an arm, a claim, a robustness check
stats       the tests, intervals, power and the gate's arithmetic
store       what a run is, the hash that names its record, the records and the points read from them
planning    which runs a campaign needs, in which order, at which learning rate
execution   running a campaign (in this process or worker processes), one record per run
verdicts    a claim's verdict from its records
claim_text, report, plots   docs/claims.md and the README's table
cli         the command line
owner       the label-skew tier's owner test
"""
