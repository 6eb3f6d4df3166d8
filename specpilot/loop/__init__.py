"""The SpecPilot loop: measure the incumbent, find its largest gap, let agents propose, gate with
token forcing, time with the controller, promote, stack, remember (`specpilot run`)."""
