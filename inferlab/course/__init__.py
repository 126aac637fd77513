"""Course tooling: the labs' checks, the student-lab generator, the grader, the course catalog.

``checks`` (one module a lab: each exercise's feedback against an oracle), ``labgen``
(``python -m inferlab.course.labgen``: the student labs from the solved ones), ``grade``
(``python -m inferlab.course.grade``: run submitted notebooks and grade them), ``verify`` (the
grader's own checks, run in a submission's kernel after it finished), ``scan`` (what a
submission's source rewrites), ``catalog`` (pages, labs, exercises and hints, read from the
repository for the grader and the instructor guide).
"""
