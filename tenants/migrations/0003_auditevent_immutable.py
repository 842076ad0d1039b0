"""Audit events are immutable: a trigger refuses UPDATE and DELETE on tenants_auditevent."""

from django.db import migrations

SQL = """
CREATE OR REPLACE FUNCTION tenants_auditevent_immutable() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit events are immutable (% refused)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER tenants_auditevent_no_change
    BEFORE UPDATE OR DELETE ON tenants_auditevent
    FOR EACH ROW EXECUTE FUNCTION tenants_auditevent_immutable();
"""

REVERSE = """
DROP TRIGGER IF EXISTS tenants_auditevent_no_change ON tenants_auditevent;
DROP FUNCTION IF EXISTS tenants_auditevent_immutable();
"""


class Migration(migrations.Migration):
    dependencies = [("tenants", "0002_quota_auditevent")]

    operations = [migrations.RunSQL(SQL, reverse_sql=REVERSE)]
