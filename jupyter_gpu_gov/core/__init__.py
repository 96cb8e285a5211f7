"""Pure core: models, durations, policy. Imports only the standard library and traitlets."""
