"""The student party: labelling rounds with the guardian, jobs for the gateway."""
