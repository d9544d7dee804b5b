"""Online learning: what training on an endless stream of ids needs.

Modules: eviction (a capacity bound and a time to live, enforced while training), admission
(new keys get rows once seen k times, or with probability p), delta (exports of the rows
changed and removed since the last export, replayed into tables or a serving SavedModel).
"""
