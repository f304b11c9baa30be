"""GAIE endpoint picker: the router of ``infera.server`` (auto mode) behind Envoy's ext_proc protocol."""
