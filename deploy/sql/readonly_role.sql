-- Read-only access to the posbias store for analysts: the `position_curve` view, `results` and every other
-- table, now and after future migrations; nothing can be written.
--
--   posbias_readonly   NOLOGIN group role holding the privileges; grant it to whoever needs to read
--   posbias_analyst    example login user, a member of posbias_readonly
--
-- Run it with psql against the posbias database, AFTER the first `posbias db upgrade`, as a role that can
-- create roles and is (or is a member of) the role that owns the posbias tables, i.e. the one that runs the
-- migrations; on a self-managed server a superuser, on a managed one (RDS, Cloud SQL) its admin user:
--
--     psql "$ADMIN_URL" -v ON_ERROR_STOP=1 -f deploy/sql/readonly_role.sql
--
-- Safe to run again (after each new release, say): roles are created only when missing, grants repeat.
-- Passwords never go in this file; give the login user one interactively:
--
--     psql "$ADMIN_URL" -c '\password posbias_analyst'
--
-- then analysts connect with e.g. postgresql://posbias_analyst@HOST:5432/posbias and query
--     SELECT * FROM position_curve WHERE model = '...' AND batch_size = 50 ORDER BY position;
--
-- Notes:
-- * Writing is refused by privileges: the roles get SELECT only, and PostgreSQL 15+ no longer lets every
--   role create objects in schema public. On PostgreSQL 14 or older, also run
--   `REVOKE CREATE ON SCHEMA public FROM PUBLIC;` and grant CREATE on it to the migration role.
-- * Like every role, they can still create TEMPORARY tables of their own, which vanish with the session.

-- The group role. NOLOGIN: privileges are held here and reach people through membership.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'posbias_readonly') THEN
        CREATE ROLE posbias_readonly NOLOGIN;
    END IF;
END
$$;

-- Connect to this database (whatever it is called) and see into schema public.
DO $$
BEGIN
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO posbias_readonly', current_database());
END
$$;
GRANT USAGE ON SCHEMA public TO posbias_readonly;

-- Every table and view there now (ALL TABLES includes views such as position_curve).
GRANT SELECT ON ALL TABLES IN SCHEMA public TO posbias_readonly;

-- And every table and view created later, by a migration of a new release. Default privileges belong to the
-- role that creates the objects, so they are set for each role that owns something in public (the migration
-- role) and for the role running this script.
DO $$
DECLARE
    owner name;
BEGIN
    FOR owner IN
        SELECT tableowner FROM pg_catalog.pg_tables WHERE schemaname = 'public'
        UNION
        SELECT viewowner FROM pg_catalog.pg_views WHERE schemaname = 'public'
        UNION
        SELECT current_user
    LOOP
        EXECUTE format(
            'ALTER DEFAULT PRIVILEGES FOR ROLE %I IN SCHEMA public GRANT SELECT ON TABLES TO posbias_readonly',
            owner
        );
    END LOOP;
END
$$;

-- An example login user. Its sessions default to read-only transactions and a statement timeout, so a
-- runaway query cannot hold the production store for long (the privileges above are what forbids writes).
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'posbias_analyst') THEN
        CREATE ROLE posbias_analyst LOGIN;
    END IF;
END
$$;
DO $$
BEGIN
    IF NOT pg_catalog.pg_has_role('posbias_analyst', 'posbias_readonly', 'MEMBER') THEN
        GRANT posbias_readonly TO posbias_analyst;
    END IF;
END
$$;
ALTER ROLE posbias_analyst SET default_transaction_read_only = on;
ALTER ROLE posbias_analyst SET statement_timeout = '10min';
