"""Security checks shared by workbench's local servers (see README "Reliability and security")."""
