"""KungFu's adaptation policies: small objects fed each step's measurements, deciding on a collective."""
