"""Other projects' files kept exactly as their authors wrote them (their licences in their
headers), for the tests to compare against or read."""
