"""The job figures: time windows, what a job did (``JobUsage``, ``JobDetail``) and the
reports' shapes, and the notes engine with its default configuration. Pure: reads
nothing but the site's configuration file."""
