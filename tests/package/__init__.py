"""The package's face: settings, light imports, devices, extras."""
