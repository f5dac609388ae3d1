"""What the accelerator can do: the device table (devices.toml) and matching a trace's device to it."""
