-- codemode state, schema version 5. An approval keeps the paths its call reaches, resolved
-- (links followed), as JSON text: a call paused for approval is answered later, and the
-- person must see where `docs/x.txt` really lands, as the live question shows it. Older rows
-- have none.
ALTER TABLE approvals ADD COLUMN paths TEXT NOT NULL DEFAULT '[]';
