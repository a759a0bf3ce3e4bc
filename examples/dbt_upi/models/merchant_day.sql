-- Payments per merchant per UTC day, from the streaming job's per-minute windows.
-- Incremental: a window's row is upserted by the stream until the watermark closes it, so each
-- run re-aggregates the newest day already here and every day after it (delete+insert by the
-- same unique key), and leaves older, final days alone.
{{
  config(
    materialized='incremental',
    unique_key=['merchant_id', 'day'],
    incremental_strategy='delete+insert',
    on_schema_change='fail',
  )
}}

select
    merchant_id,
    cast(window_start as date) as day,
    sum(payments) as payments,
    sum(amount_paise) as amount_paise,
    count(*) as active_minutes,
    max(window_end) as last_window_end
from {{ source('upi_per_minute', 'upi_counts') }}
{% if is_incremental() %}
where cast(window_start as date) >= (select coalesce(max(day), date '1970-01-01') from {{ this }})
{% endif %}
group by 1, 2
