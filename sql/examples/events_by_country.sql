-- Public keys (country has a declared domain): every country is released, zero counts included.
SELECT country, COUNT(*) AS users, AVG(amount) AS avg_amount
FROM events
GROUP BY country
ORDER BY users DESC
