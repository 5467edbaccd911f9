"""Integrations with the serving systems specscope mirrors (installed as `specscope.integrations`)."""
