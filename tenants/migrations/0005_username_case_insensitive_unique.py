"""Usernames are unique whatever their letter case ("Alice" and "alice" were two accounts):
a unique index on ``lower(username)`` of Django's ``auth_user``, which its model cannot declare.
The services check first (``tenants.members.check_username_free``); the index holds it when
two requests race. A database that already holds two such users fails here, naming them:
rename one (``manage.py shell``) and migrate again."""

from django.db import migrations

CREATE = "CREATE UNIQUE INDEX IF NOT EXISTS auth_user_username_ci_uniq ON auth_user (lower(username))"
DROP = "DROP INDEX IF EXISTS auth_user_username_ci_uniq"


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("tenants", "0004_invitation"),
    ]

    operations = [migrations.RunSQL(CREATE, DROP)]
