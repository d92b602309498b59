"""The column names of the key projection: the frame stage 1 hands to stage 2.

They are advcli's own (the projection is a fresh frame of these columns only), so a user column
called ``group`` or ``score`` never collides with them.
"""

ROW = "row"
GROUP = "group"
TRAJECTORY = "trajectory"
TURN = "turn"
SCORE = "score"
TOKENS = "tokens"
