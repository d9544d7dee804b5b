"""Online learning: what training on an endless stream of ids needs.

Modules: eviction (a capacity bound and a time to live, enforced while training), admission
(new keys get rows once seen k times, or with probability p).
"""
