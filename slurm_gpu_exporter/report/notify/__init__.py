"""Telling users: delivering a message (``send``: SMTP or a webhook) and the low-util
notices with the state that keeps them to one per job a week (``notices``)."""
