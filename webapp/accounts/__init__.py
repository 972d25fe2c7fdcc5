"""Accounts: sign-up (off unless POSTTRAIN_ALLOW_SIGNUP) beside Django's login and logout."""
