"""``capc audit``: checks on the audit logs a consortium keeps."""
