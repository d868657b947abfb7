"""Who may call what: API keys, what each may use and at which priority (``keys``), and the quotas per key shared by every replica (``quotas``)."""
