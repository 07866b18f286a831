-- A range workload over an ordered domain (age: one-year bins [0, 1) ... [119, 120)), answered by DAWA
-- with one charge through Session.query_many; later ranges over the same WHERE are free.
SELECT COUNT(*) FROM events WHERE action = 'view' AND age BETWEEN 18 AND 24;
SELECT COUNT(*) FROM events WHERE action = 'view' AND age BETWEEN 25 AND 34;
SELECT COUNT(*) FROM events WHERE action = 'view' AND age BETWEEN 35 AND 44;
SELECT COUNT(*) FROM events WHERE action = 'view' AND age BETWEEN 45 AND 64;
SELECT COUNT(*) FROM events WHERE action = 'view' AND age >= 65;
