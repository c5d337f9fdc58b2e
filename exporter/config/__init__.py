"""Configuration: flags, environment variables and the config file, resolved into one Config."""
