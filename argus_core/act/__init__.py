"""``argus act``: an Alertmanager webhook receiver that turns sustained hardware suspects into
a remediation plan (``plan``), served with its audit log and metrics (``service``)."""
