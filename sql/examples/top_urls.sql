-- Unknown keys: the Gaussian sparse histogram releases only URLs above a noisy threshold.
SELECT url, COUNT(*) AS views, SUM(likes) AS likes
FROM events
WHERE action = 'view'
GROUP BY url
ORDER BY views DESC
LIMIT 20
