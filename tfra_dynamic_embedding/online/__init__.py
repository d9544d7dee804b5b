"""Online learning: what training on an endless stream of ids needs.

Eviction, admission and TFRA's restrict policies are hooks (hooks.py): `de.Variable(eviction=,
admission=, restrict_policy=)` attaches them, and they work on the variable's public shard view
(`var.shards`); the variable imports none of these modules.

Modules: eviction (a capacity bound and a time to live, enforced while training), admission
(new keys get rows once seen k times, or with probability p), restrict_policies (TFRA's
`var.restrict(n)`: evict down to n keys, stalest or rarest first), hkv (TFRA's HKV creator: the
default tables with an eviction per shard), delta (exports of the rows changed and removed since
the last export, replayed into tables or a serving SavedModel).
"""
