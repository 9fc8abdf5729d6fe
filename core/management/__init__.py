"""What the management API keeps about the broker's clients (issue 19): the registry of open
connections of every protocol (:mod:`core.management.connections`)."""
